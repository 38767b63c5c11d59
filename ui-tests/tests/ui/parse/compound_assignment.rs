use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> [f32; n] {
        let y = x;
        y += 1.0;
        y
    }
}

fn main() {}
