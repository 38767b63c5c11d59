use fuse_runtime::fuse;

fuse! {
    fn embed(emb: [f32; vocab, e], tokens: [u32; t]) -> [f32; t, e] {
        emb[tokens]
    }
}

fn main() {}
