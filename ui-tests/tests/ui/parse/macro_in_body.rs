use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> [f32; n] {
        let y = max!(x, 0.0);
        y
    }
}

fn main() {}
