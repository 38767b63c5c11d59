use fuse_runtime::fuse;

fuse! {
    fn f(i: [i32; n]) -> i32 {
        logsumexp(i)
    }
}

fn main() {}
