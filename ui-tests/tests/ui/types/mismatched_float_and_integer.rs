use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], i: [i32; n]) -> [f32; n] {
        x * i
    }
}

fn main() {}
