use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> [f32; n] {
        let scaled = x * 2.0;
        scalde + 1.0
    }
}

fn main() {}
