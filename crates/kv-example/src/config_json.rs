//! [`Config::to_json`]: the config as the JSON object the PyTorch baseline (`gpu/torch_baseline.py`) reads.

use crate::model::RMS_EPS;
use crate::Config;

impl Config {
    /// The config as one JSON object with the keys `vocab`, `heads`, `head_dim`, `max_len`, `layers`,
    /// `prompt`, `seed`, `dtype` (`"f32"` or `"f16"`) and `rms_eps`: everything `gpu/torch_baseline.py`
    /// needs to rebuild this model with the same weights ([`crate::Weights::generate`] draws them from
    /// `seed`). `seed` is written as a plain integer (a `u64`; Python reads it exactly).
    ///
    /// ```
    /// let json = kv_example::Config::tiny().to_json();
    /// assert!(json.starts_with("{\"vocab\": 64, \"heads\": 2, "));
    /// assert!(json.contains("\"seed\": 1802895361"));
    /// ```
    pub fn to_json(&self) -> String {
        let prompt = self.prompt.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
        let dtype = self.dtype.name();
        format!(
            "{{\"vocab\": {}, \"heads\": {}, \"head_dim\": {}, \"max_len\": {}, \"layers\": {}, \"prompt\": [{}], \
             \"seed\": {}, \"dtype\": \"{}\", \"rms_eps\": {:e}}}",
            self.vocab, self.heads, self.head_dim, self.max_len, self.layers, prompt, self.seed, dtype, RMS_EPS
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    #[test]
    fn tiny_is_written_with_every_key() {
        assert_eq!(
            Config::tiny().to_json(),
            "{\"vocab\": 64, \"heads\": 2, \"head_dim\": 16, \"max_len\": 16, \"layers\": 1, \"prompt\": [1, 7, 3, 12], \
             \"seed\": 1802895361, \"dtype\": \"f32\", \"rms_eps\": 1e-5}"
        );
    }

    #[test]
    fn a_full_u64_seed_is_written_exactly() {
        let cfg = Config { seed: u64::MAX, prompt: vec![0], ..Config::tiny() };
        let json = cfg.to_json();
        assert!(json.contains("\"seed\": 18446744073709551615,"), "{json}");
        assert!(json.contains("\"prompt\": [0],"), "{json}");
    }

    #[test]
    fn an_f16_config_says_so() {
        let json = Config::bench(crate::BenchConfig::B).to_json();
        assert!(json.contains("\"dtype\": \"f16\""), "{json}");
    }
}
