use fuse_runtime::fuse;

fuse! {
    // Indices may repeat: each row of `emb`'s gradient would add up the rows its tokens pick.
    #[vjp(emb)]
    fn embedding(emb: [f32; vocab, e], tokens: [u32; t]) -> [f32; t, e] {
        emb[tokens, ..] * 2.0
    }
    // A row permutation: rows of `x` picked by index, not along another dim of `x`.
    #[vjp(x)]
    fn permuted_rows(x: [f32; n, v], order: [u32; n]) -> [f32; n, v] {
        x[order, ..].exp()
    }
    // Leaving the gathered parameter out of the list is fine.
    #[vjp(w)]
    fn scaled_embedding(emb: [f32; vocab, e], tokens: [u32; t], w: [f32; e]) -> [f32; t, e] {
        emb[tokens, ..] * w
    }
}

fn main() {}
