use fuse_runtime::fuse;

fuse! {
    fn normalize(x: [f32; n]) -> [f32; n] {
        x / sum(x)
    }
}

fn main() {}
