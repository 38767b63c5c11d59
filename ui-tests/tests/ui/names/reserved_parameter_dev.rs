use fuse_runtime::fuse;

fuse! {
    fn f(dev: [f32; n]) -> [f32; n] {
        dev
    }
}

fn main() {}
