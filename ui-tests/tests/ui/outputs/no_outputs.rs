use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> () {
        ()
    }
}

fn main() {}
