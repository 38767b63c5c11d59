use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> [f32; n] {
        (x as usize) as f32
    }
}

fn main() {}
