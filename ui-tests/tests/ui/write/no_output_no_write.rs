use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) {
        let y = x * 2.0;
    }
}

fn main() {}
