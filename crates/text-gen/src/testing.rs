//! For tests of the tools that read text (`delegate-host run`, `et-run`): a small byte-level BPE tokenizer
//! trained here on a corpus with multi-byte characters, of exactly the vocabulary a test program has.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

/// The corpus [`train`] learns from: accents, CJK characters spread over several bytes, punctuation.
pub const CORPUS: [&str; 5] = [
    "héllo wörld 日本",
    "hello world, the quick brown fox jumps over the lazy dog",
    "wörld of héllo: 日本語 and 日本 again",
    "a cache holds keys and values; the model reads them back",
    "tokens stream out one by one, never half a character",
];

/// A byte-level BPE of exactly `vocab` ids (at least the 256 byte symbols' worth of merges allowing; the
/// programs' 128 works), trained on [`CORPUS`], with `<eos>` as id 0.
///
/// # Panics
/// When the trainer fails or cannot reach `vocab` ids (a test's set-up error).
pub fn train(vocab: usize) -> Tokenizer {
    let trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab)
        .min_frequency(0)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from("<eos>", true)])
        .build();
    let mut trainer: TrainerWrapper = trainer.into();
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::default()));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    let corpus: Vec<String> = CORPUS.iter().map(|l| (*l).to_owned()).cycle().take(50).collect();
    tokenizer.train(&mut trainer, corpus.into_iter()).expect("the tokenizer trains");
    assert_eq!(tokenizer.get_vocab_size(true), vocab, "the trained vocabulary");
    tokenizer
}
