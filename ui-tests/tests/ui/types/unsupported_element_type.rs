use fuse_runtime::fuse;

fuse! {
    fn f(s: [String; n]) -> [f32; n] {
        s
    }
}

fn main() {}
