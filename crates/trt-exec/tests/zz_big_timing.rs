use trt_exec::decoder::*;
#[test]
fn big() {
    let c = kv_example::Config::big();
    let cfg = DecoderConfig {
        vocab: c.vocab,
        heads: c.heads,
        head_dim: c.head_dim,
        max_len: c.max_len,
        layers: c.layers,
    };
    let weights = DecoderWeights::filler(cfg, 3);
    for rows in [c.prompt_len(), 1] {
        let t = std::time::Instant::now();
        let (_, blob, built) =
            decoder_blob(&cfg, &weights, rows, &trt_exec::BuildOptions::default()).expect("builds");
        eprintln!(
            "big rows {rows}: build {:?}, total {:?}, blob {} bytes",
            built.build_time,
            t.elapsed(),
            blob.len()
        );
    }
}
