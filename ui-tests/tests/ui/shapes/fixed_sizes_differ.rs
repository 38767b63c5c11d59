use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; 3], y: [f32; 4]) -> [f32; 3] {
        x + y
    }
}

fn main() {}
