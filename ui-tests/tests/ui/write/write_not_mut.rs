use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n, c], out: [f32; m, c], i: [u32; n]) {
        out[i, ..] = x;
    }
}

fn main() {}
