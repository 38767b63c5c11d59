use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], i: [i32; n]) -> [f32; n] {
        if x > 0.0 { x } else { i }
    }
}

fn main() {}
