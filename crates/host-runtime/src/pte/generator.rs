//! The generation convention ([`crate::pte`]'s module docs): which methods prefill and decode, and where
//! their tokens, positions and logits are.

use blob_format::model::DType;
use program_manifest::{Generate, Manifest, Method};

use super::decl::describe;

/// The names of a method's tokens input, position input and logits output.
type Names = (String, String, String);

/// The generation section for `manifest` under the generation convention (module docs), or why it does
/// not follow it.
pub(super) fn generator(
    manifest: &Manifest,
    prompt: &[i64],
    max_positions: Option<u64>,
) -> Result<Generate, String> {
    let (prefill, decode) =
        if manifest.methods.contains_key("prefill") && manifest.methods.contains_key("decode") {
            ("prefill", "decode")
        } else if manifest.methods.contains_key("forward") {
            ("forward", "forward")
        } else {
            return Err("it has neither methods 'prefill' and 'decode' nor a method 'forward'".into());
        };
    if prompt.is_empty() {
        return Err("the prompt is empty".into());
    }
    // Beside a decode method, prefill takes the prompt in chunks and decode the tokens short of a chunk.
    let step = if prefill == decode { Step::Prefill(prompt.len()) } else { Step::Chunks };
    let names = step_names(&manifest.methods[prefill], step)?;
    if step_names(&manifest.methods[decode], Step::Decode)? != names {
        return Err("methods 'prefill' and 'decode' name their inputs and outputs differently".into());
    }
    let (token_input, position_input, logits_output) = names;
    let next_token_output = next_token(&manifest.methods[decode]);
    if next_token(&manifest.methods[prefill]) != next_token_output {
        return Err("methods 'prefill' and 'decode' name their next-token outputs differently".into());
    }
    if let Some(max) = max_positions {
        if prompt.len() as u64 > max {
            return Err(format!(
                "the prompt of {} tokens is longer than the {max} positions the caches hold",
                prompt.len()
            ));
        }
    }
    Ok(Generate {
        prefill: prefill.to_owned(),
        decode: decode.to_owned(),
        prompt: prompt.to_vec(),
        token_input,
        position_input,
        logits_output,
        next_token_output,
        max_positions,
    })
}

/// The method's output 1 when it is the greedy next token (`i64`, one element): what the device loop feeds
/// back without the host reading the logits.
fn next_token(method: &Method) -> Option<String> {
    let next = method.outputs.get(1)?;
    (next.dtype == DType::I64 && next.numel() == 1).then(|| next.name.clone())
}

/// What a method is used for: feeding a prompt of this many tokens alone, feeding a prompt in chunks beside a
/// decode method, or decoding one token per call.
#[derive(Clone, Copy)]
enum Step {
    Prefill(usize),
    Chunks,
    Decode,
}

/// The names of `method`'s tokens, position and logits, once they follow the convention for `step`.
fn step_names(method: &Method, step: Step) -> Result<Names, String> {
    let m = &method.name;
    let (Some(tokens), Some(pos), Some(logits)) =
        (method.inputs.first(), method.inputs.get(1), method.outputs.first())
    else {
        return Err(format!("method '{m}' needs inputs 0 (tokens) and 1 (input_pos) and output 0 (logits)"));
    };
    // `[T]`, or `[1, T]` as Hugging Face's `input_ids` (batch 1): the same bytes.
    let batched = tokens.shape.len() == 2 && tokens.shape[0] == 1;
    if tokens.dtype != DType::I64 || !(tokens.shape.len() == 1 || batched) {
        return Err(format!("input 0 of method '{m}' is {}, not i64 [T] or [1, T]", describe(tokens)));
    }
    if pos.dtype != DType::I64 || pos.shape != [1] {
        return Err(format!("input 1 of method '{m}' is {}, not i64 [1]", describe(pos)));
    }
    let rows = tokens.shape[tokens.shape.len() - 1];
    let logit_rows = match logits.shape.as_slice() {
        [t, _] => Some(*t),
        [1, t, _] if batched => Some(*t),
        _ => None,
    };
    if !matches!(logits.dtype, DType::F32 | DType::F16 | DType::BF16) || logit_rows != Some(rows) {
        let shape = if batched { format!("[1, {rows}, vocab]") } else { format!("[{rows}, vocab]") };
        return Err(format!(
            "output 0 of method '{m}' is {}, not f32, f16 or bf16 {shape}",
            describe(logits)
        ));
    }
    match step {
        Step::Prefill(prompt) if rows == 0 || prompt as u64 % rows != 0 => {
            return Err(format!(
                "method '{m}' takes {rows} tokens, which does not divide the prompt of {prompt}"
            ));
        }
        Step::Chunks if rows == 0 => return Err(format!("method '{m}' takes no tokens")),
        Step::Decode if rows != 1 => {
            return Err(format!("method '{m}' takes {rows} tokens per call; decoding feeds one"));
        }
        _ => {}
    }
    Ok((tokens.name.clone(), pos.name.clone(), logits.name.clone()))
}
