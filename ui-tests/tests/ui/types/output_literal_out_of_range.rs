use fuse_runtime::fuse;

// An untyped literal takes the output's type, and must fit it.
fuse! {
    fn f() -> i32 {
        -18446744073709551615
    }
}

fn main() {}
