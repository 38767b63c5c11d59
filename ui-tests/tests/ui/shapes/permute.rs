use fuse_runtime::fuse;

fuse! {
    fn not_a_parameter(x: [f32; r, c], y: [f32; c, r]) -> [f32; r, c] {
        x + permute(y * 2.0, (r, c))
    }
    fn dims_not_a_tuple(x: [f32; r, c], y: [f32; c, r]) -> [f32; r, c] {
        x + permute(y, r)
    }
    fn dim_twice(x: [f32; r, c], y: [f32; c, r]) -> [f32; r, c] {
        x + permute(y, (r, r))
    }
    fn dim_of_another(x: [f32; r, c], y: [f32; c, r], z: [f32; k]) -> [f32; r, c] {
        x + permute(y, (r, k)) + sum(z)
    }
    fn dim_left_out(x: [f32; r, c], y: [f32; c, r, k]) -> [f32; r, c] {
        x + sum(permute(y, (r, c)), k)
    }
    fn written(x: [f32; r, c], y: &mut [f32; c, r]) {
        y[.., ..] = x + permute(y, (r, c));
    }
}

fn main() {}
