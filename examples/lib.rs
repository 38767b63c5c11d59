//! Runnable examples of fuse; see `quickstart.rs`, `softmax.rs` and `layernorm.rs` beside this file.
