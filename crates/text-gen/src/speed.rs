//! How fast a reply came: the time to its first token and the tokens per second after it.

use std::time::Duration;

/// The time to the first token and the tokens per second after it (the tokens after the first over the time
/// from the first to the last), from each token's time since the start; `None` where there is too little to
/// tell.
pub fn speed(times: &[Duration]) -> (Option<Duration>, Option<f64>) {
    let first = times.first().copied();
    let rate = match (first, times.last()) {
        (Some(first), Some(&last)) if times.len() > 1 && last > first => {
            Some((times.len() - 1) as f64 / (last - first).as_secs_f64())
        }
        _ => None,
    };
    (first, rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_counts_the_tokens_after_the_first() {
        let ms = Duration::from_millis;
        assert_eq!(speed(&[ms(100), ms(150), ms(200)]), (Some(ms(100)), Some(20.0)));
        assert_eq!(speed(&[ms(100)]), (Some(ms(100)), None));
        assert_eq!(speed(&[]), (None, None));
    }
}
