use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], s: &mut f32) -> [f32; n] {
        x
    }
}

fn main() {}
