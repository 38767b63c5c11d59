use fuse_runtime::fuse;

fuse! {
    fn f(x: [i32; n]) -> [i32; n] {
        match x {
            0 => 1,
            _ => x,
        }
    }
}

fn main() {}
