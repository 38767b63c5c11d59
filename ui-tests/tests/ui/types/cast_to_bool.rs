use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> [bool; n] {
        x as bool
    }
}

fn main() {}
