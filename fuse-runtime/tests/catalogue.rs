#[allow(dead_code)]
#[path = "catalogue/kernels.rs"]
mod kernels;
#[test]
fn builds() {}
