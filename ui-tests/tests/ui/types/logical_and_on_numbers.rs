use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], y: [f32; n]) -> [bool; n] {
        x && y
    }
}

fn main() {}
