//! The generated Rust items. For each `fn name` of the input:
//! - `fn name(dev, inputs..) -> Result<outputs, Error>`, which allocates its outputs;
//! - `mod name` with `CUDA_SOURCE`, the write-into form `into(dev, inputs.., &mut outputs..)`, the
//!   signature the runtime checks shapes against, and the CPU implementation.
//!
//! Generated code names only `::fuse_runtime::…` paths. On any error the items are still emitted,
//! with the same signatures and unreachable bodies, so that one mistake gives one error.

use crate::check::{check, DEVICE_ARG};
use crate::error::Errors;
use crate::ir::{Dim, Kernel, Launch};
use crate::parse::KernelDef;
use crate::ty::Elem;
use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote};
use syn::ext::IdentExt;

const RT: &str = "::fuse_runtime";

pub fn fuse(input: TokenStream) -> TokenStream {
    let input = match crate::parse::parse_input(input) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    let mut cx = Errors::default();
    let kernels = check(&input, &mut cx);
    match cx.propagate() {
        Ok(()) => {
            let (archs, mut out) = crate::cubin::requested_at(kernels.first().map(|k| &k.name));
            out.extend(kernels.iter().map(|k| expand_kernel(k, &archs)));
            out
        }
        Err(e) => {
            let mut out = e.to_compile_error();
            // One stub per name: rustc would report a duplicate a second time.
            let mut seen = std::collections::HashSet::new();
            out.extend(
                input
                    .kernels
                    .iter()
                    .filter(|k| seen.insert(plain_name(&k.name)))
                    .map(stub),
            );
            out
        }
    }
}

/// A generated local name, hygienic to the macro, so that no parameter name can capture it.
fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// An identifier's text without `r#`.
pub fn plain_name(ident: &Ident) -> String {
    ident.unraw().to_string()
}

fn rt() -> TokenStream {
    RT.parse().expect("a path")
}

/// The Rust type of an element: a primitive, or the runtime's re-export of `half`'s types.
fn elem_tokens(e: Elem) -> TokenStream {
    let path = if e.is_half() {
        format!("{RT}::{}", e.name())
    } else {
        e.name().to_string()
    };
    path.parse().expect("a type path")
}

/// The Rust-facing signature of a kernel, which a stub shares with the real items.
struct RustSig {
    inputs: Vec<(Ident, Elem, bool)>,
    outputs: Vec<Elem>,
    tuple: bool,
}

impl RustSig {
    /// The signature of a kernel that did not check, for its stub: parameter names are made
    /// distinct (and clear of the device argument) so rustc adds no error of its own.
    fn from_def(def: &KernelDef) -> RustSig {
        let mut seen = std::collections::HashSet::new();
        seen.insert(DEVICE_ARG.to_string());
        let inputs = def
            .params
            .iter()
            .map(|p| {
                let mut name = plain_name(&p.name);
                let mut ident = p.name.clone();
                while !seen.insert(name.clone()) {
                    // A suffixed name is no keyword, so it needs no `r#` (which it may have had).
                    name.push('_');
                    ident = Ident::new(&name, p.name.span());
                }
                (
                    ident,
                    p.ty.elem.resolve().unwrap_or(Elem::F32),
                    p.ty.dims.is_some(),
                )
            })
            .collect();
        let outputs = def
            .output
            .types
            .iter()
            .map(|t| t.elem.resolve().unwrap_or(Elem::F32))
            .collect();
        RustSig {
            inputs,
            outputs,
            tuple: def.output.tuple,
        }
    }

    fn from_kernel(k: &Kernel) -> RustSig {
        let inputs = k
            .params
            .iter()
            .map(|p| (p.name.clone(), p.elem, p.shape.is_some()))
            .collect();
        RustSig {
            inputs,
            outputs: k.outputs.iter().map(|o| o.elem).collect(),
            tuple: k.tuple,
        }
    }

    fn input_params(&self) -> TokenStream {
        let rt = rt();
        self.inputs
            .iter()
            .map(|(name, e, tensor)| {
                let t = elem_tokens(*e);
                if *tensor {
                    quote!(#name: &impl #rt::Input<#t>,)
                } else {
                    quote!(#name: #t,)
                }
            })
            .collect()
    }

    fn output_names(&self) -> Vec<Ident> {
        (0..self.outputs.len())
            .map(|j| {
                let mut name = if self.tuple {
                    format!("out{j}")
                } else {
                    "out".to_string()
                };
                while self.inputs.iter().any(|(n, _, _)| plain_name(n) == name)
                    || name == DEVICE_ARG
                {
                    name.push('_');
                }
                Ident::new(&name, Span::call_site())
            })
            .collect()
    }

    fn output_params(&self) -> TokenStream {
        let rt = rt();
        self.output_names()
            .iter()
            .zip(&self.outputs)
            .map(|(name, e)| {
                let t = elem_tokens(*e);
                quote!(#name: &mut impl #rt::Output<#t>,)
            })
            .collect()
    }

    fn return_type(&self) -> TokenStream {
        let rt = rt();
        let types: Vec<TokenStream> = self
            .outputs
            .iter()
            .map(|e| {
                let t = elem_tokens(*e);
                quote!(#rt::Buffer<#t>)
            })
            .collect();
        if self.tuple {
            quote!((#(#types),*))
        } else {
            quote!(#(#types)*)
        }
    }

    fn input_names(&self) -> Vec<&Ident> {
        self.inputs.iter().map(|(n, _, _)| n).collect()
    }
}

fn stub(def: &KernelDef) -> TokenStream {
    let sig = RustSig::from_def(def);
    let (vis, name, attrs) = (&def.vis, &def.name, &def.attrs);
    let rt = rt();
    let dev = format_ident!("{}", DEVICE_ARG);
    let (inputs, outputs, ret) = (sig.input_params(), sig.output_params(), sig.return_type());
    let unreachable = quote!(::core::unreachable!("this `fuse!` kernel has errors"));
    quote! {
        #(#attrs)*
        #[allow(unused_variables, clippy::all)]
        #vis fn #name(#dev: &#rt::Device, #inputs) -> ::core::result::Result<#ret, #rt::Error> { #unreachable }
        #[allow(unused_variables, clippy::all)]
        #vis mod #name {
            pub const CUDA_SOURCE: &str = "";
            pub fn into(#dev: &#rt::Device, #inputs #outputs) -> ::core::result::Result<(), #rt::Error> { #unreachable }
            pub fn load(#dev: &#rt::Device) -> ::core::result::Result<(), #rt::Error> { #unreachable }
        }
    }
}

/// The items of kernel `k`, with its CUBIN for each of `archs` (see [`crate::cubin`]).
fn expand_kernel(k: &Kernel, archs: &[u32]) -> TokenStream {
    let plan = crate::plan::plan(k);
    let source = crate::cuda::source(k, &plan);
    let (cubins, cubin_error) = crate::cubin::embed(&k.name, &source.text, archs);
    let sig = RustSig::from_kernel(k);
    let rt = rt();
    let (vis, name, attrs) = (&k.vis, &k.name, &k.attrs);
    let dev = format_ident!("{}", DEVICE_ARG);
    let dims = local("dims");
    let (inputs, ret) = (sig.input_params(), sig.return_type());
    let input_names = sig.input_names();
    let out_names = sig.output_names();
    let n_inputs = k.params.iter().filter(|p| p.shape.is_some()).count();
    let tensor_inputs: Vec<&Ident> = k.tensor_params().map(|(_, p, _)| &p.name).collect();
    let alloc = out_names.iter().zip(&k.outputs).enumerate().map(|(j, (o, out))| {
        let t = elem_tokens(out.elem);
        let index = n_inputs + j;
        quote! {
            let mut #o = #rt::__private::alloc::<#t>(#dev, &#rt::__private::shape_of(&#name::__fuse::SIGNATURE, #index, &#dims))?;
        }
    });
    let result = if k.tuple {
        quote!((#(#out_names),*))
    } else {
        quote!(#(#out_names)*)
    };
    let doc = fn_doc(k);
    let mod_doc = format!(
        "Items of the fused kernel [`{}()`](fn@{}): its CUDA C text and its write-into form.",
        plain_name(name),
        plain_name(name)
    );
    let module = module_items(k, &plan, &sig, &source, &cubins);
    quote! {
        #cubin_error
        #(#attrs)*
        #[doc = #doc]
        #[allow(clippy::too_many_arguments)]
        #vis fn #name(#dev: &#rt::Device, #inputs) -> ::core::result::Result<#ret, #rt::Error> {
            let #dims = #rt::__private::bind(&#name::__fuse::SIGNATURE, #dev, &[#(#tensor_inputs as &dyn #rt::__private::AnyBuffer),*])?;
            #(#alloc)*
            #name::into(#dev, #(#input_names,)* #(&mut #out_names),*)?;
            ::core::result::Result::Ok(#result)
        }
        #[doc = #mod_doc]
        #vis mod #name {
            #module
        }
    }
}

fn fn_doc(k: &Kernel) -> String {
    let params: Vec<String> = k
        .params
        .iter()
        .map(|p| match &p.shape {
            Some(s) => format!("`{}: {}`", plain_name(&p.name), type_text(k, p.elem, s)),
            None => format!("`{}: {}`", plain_name(&p.name), p.elem),
        })
        .collect();
    let outputs: Vec<String> = k
        .outputs
        .iter()
        .map(|o| format!("`{}`", type_text(k, o.elem, &o.shape)))
        .collect();
    format!(
        "\n\nFused kernel, one launch ({}). Takes {}; returns {}, allocated on `dev`. \
         Shapes are checked against the declared dims at the call. `{}::into` writes into \
         preallocated outputs; `{}::CUDA_SOURCE` is the generated CUDA C.",
        launch_text(k),
        if params.is_empty() {
            "nothing".to_string()
        } else {
            params.join(", ")
        },
        outputs.join(", "),
        plain_name(&k.name),
        plain_name(&k.name),
    )
}

fn type_text(k: &Kernel, e: Elem, shape: &[usize]) -> String {
    if shape.is_empty() {
        return e.to_string();
    }
    let dims: Vec<String> = shape.iter().map(|&d| k.dims[d].to_string()).collect();
    format!("[{e}; {}]", dims.join(", "))
}

fn launch_text(k: &Kernel) -> String {
    match &k.launch {
        Launch::Map { .. } => "elementwise".into(),
        Launch::Rows { axis, .. } => format!("reducing over `{}` row by row", k.dims[*axis]),
        Launch::Full { .. } => "reducing over every element".into(),
    }
}

/// The size of a dim at launch: an entry of `dims` or a fixed literal.
fn dim_size(k: &Kernel, d: usize) -> TokenStream {
    match (&k.dims[d], k.named_index(d)) {
        (_, Some(i)) => {
            let dims = local("dims");
            quote!(#dims[#i])
        }
        (Dim::Fixed(v), None) => {
            let v = *v as usize;
            quote!(#v)
        }
        (Dim::Named(_), None) => unreachable!("a named dim has an index"),
    }
}

fn product(k: &Kernel, dims: &[usize]) -> TokenStream {
    let sizes = dims.iter().map(|&d| dim_size(k, d));
    quote!((1u64 #(* (#sizes as u64))*))
}

/// The 4-element vectors each thread of an elementwise kernel takes (see `Geometry::Map`):
/// eight where a thread sets up Philox's keys (W3 on an H200: 74% of copy bandwidth at four,
/// 77% at eight); four where it sets up the reciprocals of a broadcast's index; two where each
/// element calls a math routine (`exp`, `ln`, `tanh`...), which makes the kernel bound by its
/// instructions on a GPU with fast memory, so a thread's own setup and loop costs are worth
/// spreading over two vectors (W1 on an H200: 93% with one, 99% with two; benches/NOTES.md item
/// 30); else one, which keeps the most loads in flight for kernels that only stream (W10: 103%
/// with one, 102% with two).
fn map_vectors(k: &Kernel, domain: &[usize]) -> u32 {
    let broadcast = k
        .tensor_params()
        .any(|(_, _, shape)| shape.as_slice() != domain)
        || k.outputs.iter().any(|o| o.shape.as_slice() != domain);
    let random = k.draws_random();
    let routine = k
        .nodes
        .iter()
        .any(|n| matches!(&n.op, crate::ir::Op::Call(f, _) if f.is_routine()));
    match (random, broadcast, routine) {
        (true, _, _) => 8,
        (false, true, _) => 4,
        (false, false, true) => 2,
        (false, false, false) => 1,
    }
}

/// The most blocks per SM of a row kernel's grid (`Geometry::Rows`). Many short-lived blocks
/// (160 per SM) stream best where a kernel writes whole rows: a block's row writes cover the
/// start of the next block's loads. Longer-lived blocks (40 per SM), each copying its next row
/// while it works through the passes of this one, keep a kernel fed where it has three reducing
/// passes over the row (W7: mean, variance, absolute maximum; bound by its instructions) or
/// writes a value per row only (W9, cross-entropy: its rows are read, reduced and left, so
/// little but the copy ahead hides the next row's loads). Measured (benches/NOTES.md, items 27,
/// 28 and 30): on an H200, W9 96% at 40 against 86% at 160, W7 70% against 67%, W5 95% at 160
/// against 91% at 40; on an H100 the per-row case was 97% at 40 and 100% at 160, and the fast
/// memory decides here.
fn row_blocks_per_sm(k: &Kernel, domain: &[usize], plan: &crate::plan::Plan) -> u32 {
    let writes_rows = k.outputs.iter().any(|o| o.shape.as_slice() == domain);
    match (plan.reducing_passes(), writes_rows) {
        (0..=2, true) => 160,
        _ => 40,
    }
}

/// The most blocks per SM of a row kernel's grid where a block loads whole rows straight into
/// registers (`Geometry::Rows`; `cuda::direct_row_cost`), else 0. With no copy ahead a block
/// waits for each row's loads, which other blocks overlap: hundreds of blocks an SM, a few of
/// them resident at once, each a row or two; the fewer instructions an element costs, the
/// more. Measured on an H200, two runs each (benches/NOTES.md, items 55 and 57), in GB/s:
///
/// | blocks an SM | 160 | 240 | 320 | 480 | a block a row |
/// | --- | --- | --- | --- | --- | --- |
/// | W8 (RMSNorm, cost 5) | 4246 | 4280 | 4296 | **4337** | 4326 |
/// | W5 (softmax, cost 15) | 4260 | 4288 | **4297** | 4266 | 4255 |
///
/// For the whole kernel, 320 cost softmax's shorter rows (1024 columns) 6 points, so these
/// grids are for these rows only.
fn direct_blocks_per_sm(k: &Kernel, plan: &crate::plan::Plan) -> u32 {
    match crate::cuda::direct_row_cost(k, plan) {
        None => 0,
        Some(0..=8) => 480,
        Some(_) => 320,
    }
}

fn geometry(k: &Kernel, plan: &crate::plan::Plan) -> TokenStream {
    let g = quote!(::fuse_runtime::__private::Geometry);
    match &k.launch {
        Launch::Map { domain } => {
            let elems = product(k, domain);
            let vectors = map_vectors(k, domain);
            quote!(#g::Map { elems: #elems, vectors: #vectors })
        }
        Launch::Rows { domain, axis } => {
            let rows: Vec<usize> = domain.iter().copied().filter(|d| d != axis).collect();
            let (groups, len) = (product(k, &rows), product(k, &[*axis]));
            let cache_bytes = crate::cuda::cached_bytes(k, plan);
            let blocks_per_sm = row_blocks_per_sm(k, domain, plan);
            let direct_blocks_per_sm = direct_blocks_per_sm(k, plan);
            quote!(#g::Rows {
                groups: #groups,
                row_len: #len,
                cache_bytes: #cache_bytes,
                blocks_per_sm: #blocks_per_sm,
                direct_blocks_per_sm: #direct_blocks_per_sm,
            })
        }
        Launch::Full { domain } => {
            let elems = product(k, domain);
            let slots: usize = k
                .nodes
                .iter()
                .filter_map(|n| match n.op {
                    crate::ir::Op::Reduce(op, ..) => Some(crate::cuda::slot_count(op)),
                    _ => None,
                })
                .sum();
            let slots = slots as u32;
            quote!(#g::Full { elems: #elems, slots: #slots })
        }
    }
}

fn signature(k: &Kernel, sig: &RustSig) -> TokenStream {
    let rt = rt();
    let dims: Vec<&str> = k.named_dims().map(|(_, n)| n).collect();
    let dim_refs = |shape: &[usize]| -> Vec<TokenStream> {
        shape
            .iter()
            .map(|&d| match (&k.dims[d], k.named_index(d)) {
                (_, Some(i)) => quote!(#rt::__private::DimRef::Named(#i)),
                (Dim::Fixed(v), None) => {
                    let v = *v as usize;
                    quote!(#rt::__private::DimRef::Fixed(#v))
                }
                _ => unreachable!("a named dim has an index"),
            })
            .collect()
    };
    let inputs = k
        .tensor_params()
        .map(|(_, p, s)| (plain_name(&p.name), s.clone(), false));
    let outputs = sig
        .output_names()
        .into_iter()
        .zip(&k.outputs)
        .map(|(n, o)| (plain_name(&n), o.shape.clone(), true));
    let tensors = inputs.chain(outputs).map(|(name, shape, output)| {
        let refs = dim_refs(&shape);
        quote!(#rt::__private::TensorSig { name: #name, dims: &[#(#refs),*], output: #output })
    });
    let kernel = plain_name(&k.name);
    quote! {
        #[doc(hidden)]
        pub static SIGNATURE: #rt::__private::Signature = #rt::__private::Signature {
            kernel: #kernel,
            dims: &[#(#dims),*],
            tensors: &[#(#tensors),*],
        };
    }
}

fn module_items(
    k: &Kernel,
    plan: &crate::plan::Plan,
    sig: &RustSig,
    source: &crate::cuda::Source,
    cubins: &TokenStream,
) -> TokenStream {
    let rt = rt();
    let dev = format_ident!("{}", DEVICE_ARG);
    let (inputs, outputs) = (sig.input_params(), sig.output_params());
    let kernel = plain_name(&k.name);
    let symbol = crate::cuda::symbol(k);
    let signature = signature(k, sig);
    let out_names = sig.output_names();
    let tensor_inputs: Vec<&Ident> = k.tensor_params().map(|(_, p, _)| &p.name).collect();
    let scalars: Vec<&Ident> = k
        .params
        .iter()
        .filter(|p| p.shape.is_none())
        .map(|p| &p.name)
        .collect();
    let dims = local("dims");
    let dim_args = (0..k.named_dims().count()).map(|i| quote!(#rt::__private::Arg::Dim(#dims[#i])));
    let recip_args = source.divisors.iter().map(|d| {
        let (size, by) = (product(k, &d.dims), u64::from(d.by));
        quote!(#rt::__private::Arg::Scalar(#rt::__private::reciprocal(#size / #by)))
    });
    let key_args: Vec<TokenStream> = source
        .seeds
        .iter()
        .flat_map(|&p| (1..crate::cuda::ROUNDS).map(move |i| (&k.params[p].name, i)))
        .map(|(seed, i)| quote!(#rt::__private::Arg::Scalar(#rt::__private::round_key(#seed, #i))))
        .collect();
    let source = &source.text;
    let geometry = geometry(k, plan);
    let picked = local("geometry");
    let (entries, kernel_info, long_rows) = entry_items(k, plan, &picked);
    let args = quote! {
        &[
            #(#rt::__private::Arg::Buffer(#tensor_inputs),)*
            #(#rt::__private::Arg::Output(&*#out_names),)*
            #(#rt::__private::Arg::Scalar(#rt::Element::to_bits(#scalars)),)*
            #(#dim_args,)*
            #(#recip_args,)*
            #(#key_args,)*
        ]
    };
    let launch = match long_rows {
        Some(long_rows) => {
            quote!(#rt::__private::launch_long_rows(#dev, #kernel_info, #long_rows, #picked, #args))
        }
        None => quote!(#rt::__private::launch(#dev, #kernel_info, #picked, #args)),
    };
    let cpu = cpu_items(k, plan, sig);
    let into_doc = format!("Runs [`{kernel}()`](fn@super::{kernel}) into preallocated outputs, for loops that must not allocate (and CUDA graph captures).");
    let load_doc = format!("Loads [`{kernel}()`](fn@super::{kernel}) on `dev` now, as its first call would, and readies the stream's reduction scratch: call it before capturing a CUDA graph that uses the kernel. Does nothing on the CPU.");
    quote! {
        /// The CUDA C text of this kernel, compiled by NVRTC on its first use on a device.
        pub const CUDA_SOURCE: &str = #source;
        /// What the runtime needs of this kernel; in a module of its own so that no parameter
        /// name can shadow it.
        #[doc(hidden)]
        pub mod __fuse {
            /// The CUBINs compiled when the crate was built (`FUSE_CUBIN_ARCHS`), by architecture.
            const CUBINS: &[(u32, &[u8])] = #cubins;
            pub static KERNEL: #rt::__private::KernelInfo = #rt::__private::KernelInfo { name: #kernel, symbol: #symbol, source: super::CUDA_SOURCE, cubins: CUBINS };
            #rt::__private::inventory::submit! {
                #rt::__private::KernelInfo { name: #kernel, symbol: #symbol, source: super::CUDA_SOURCE, cubins: CUBINS }
            }
            #entries
            #signature
        }
        #[doc = #into_doc]
        #[allow(clippy::too_many_arguments)]
        pub fn into(#dev: &#rt::Device, #inputs #outputs) -> ::core::result::Result<(), #rt::Error> {
            let #dims = #rt::__private::bind(
                &self::__fuse::SIGNATURE,
                #dev,
                &[#(#tensor_inputs as &dyn #rt::__private::AnyBuffer,)* #(&*#out_names as &dyn #rt::__private::AnyBuffer),*],
            )?;
            if #rt::__private::is_cpu(#dev) {
                return self::cpu(&#dims, #(#tensor_inputs,)* #(#scalars,)* #(#out_names),*);
            }
            let #picked = #geometry;
            #launch
        }
        #[doc = #load_doc]
        pub fn load(#dev: &#rt::Device) -> ::core::result::Result<(), #rt::Error> {
            #dev.load(&self::__fuse::KERNEL)
        }
        #cpu
    }
}

/// For a kernel with entry points for short or long rows: their `KernelInfo`s (in `__fuse`,
/// beside `KERNEL`, and like it but for the symbol); the expression that picks the entry for the
/// launch's `geometry`, the short one for rows of 1 to [`SHORT`](crate::cuda::SHORT) elements,
/// else `KERNEL`; and the long one's path, which the runtime picks for long rows when the device
/// has the shared memory.
fn entry_items(
    k: &Kernel,
    plan: &crate::plan::Plan,
    geometry: &Ident,
) -> (TokenStream, TokenStream, Option<TokenStream>) {
    let rt = rt();
    let kernel = plain_name(&k.name);
    let info = |name: &Ident, symbol: &str, doc: &str| {
        quote! {
            #[doc = #doc]
            pub static #name: #rt::__private::KernelInfo = #rt::__private::KernelInfo { name: #kernel, symbol: #symbol, source: super::CUDA_SOURCE, cubins: CUBINS };
        }
    };
    let (mut infos, mut pick, mut long) = (quote!(), quote!(&self::__fuse::KERNEL), None);
    if let Some(symbol) = crate::cuda::short_rows_symbol(k, plan) {
        let short = crate::cuda::SHORT as u64;
        let doc = format!("The entry point for rows of 1 to {short} elements, in the same module.");
        infos.extend(info(&format_ident!("SHORT_ROWS"), &symbol, &doc));
        pick = quote! {
            match #geometry {
                #rt::__private::Geometry::Rows { row_len: 1..=#short, .. } => &self::__fuse::SHORT_ROWS,
                _ => &self::__fuse::KERNEL,
            }
        };
    }
    if let Some(symbol) = crate::cuda::long_rows_symbol(k, plan) {
        let doc = "The entry point for rows longer than the register cache, with the row in dynamic shared memory, in the same module.";
        infos.extend(info(&format_ident!("LONG_ROWS"), &symbol, doc));
        long = Some(quote!(&self::__fuse::LONG_ROWS));
    }
    (infos, pick, long)
}

fn cpu_items(k: &Kernel, plan: &crate::plan::Plan, sig: &RustSig) -> TokenStream {
    let rt = rt();
    let out_names = sig.output_names();
    let tensors: Vec<(&Ident, TokenStream)> = k
        .tensor_params()
        .map(|(_, p, _)| (&p.name, elem_tokens(p.elem)))
        .collect();
    let scalars: Vec<(&Ident, TokenStream)> = k
        .params
        .iter()
        .filter(|p| p.shape.is_none())
        .map(|p| (&p.name, elem_tokens(p.elem)))
        .collect();
    let outs: Vec<TokenStream> = k.outputs.iter().map(|o| elem_tokens(o.elem)).collect();
    let (t_names, t_types): (Vec<_>, Vec<_>) = tensors.iter().cloned().unzip();
    let (s_names, s_types): (Vec<_>, Vec<_>) = scalars.iter().cloned().unzip();
    // Host copies in `cpu`; the parameter names of `compute`, which the CPU backend's body uses.
    let h_t: Vec<Ident> = (0..t_names.len())
        .map(|i| local(&format!("__t{i}")))
        .collect();
    let h_o: Vec<Ident> = (0..outs.len()).map(|j| local(&format!("__o{j}"))).collect();
    let dims = local("dims");
    let p_t: Vec<Ident> = t_names
        .iter()
        .map(|n| format_ident!("p_{}", plain_name(n)))
        .collect();
    let p_s: Vec<Ident> = s_names
        .iter()
        .map(|n| format_ident!("p_{}", plain_name(n)))
        .collect();
    let out_idents: Vec<Ident> = (0..outs.len()).map(|j| format_ident!("out{}", j)).collect();
    let dim_lets = k.named_dims().enumerate().map(|(i, (_, n))| {
        let d = format_ident!("d_{}", n);
        let dims = local("dims");
        quote!(let #d: usize = #dims[#i];)
    });
    let body: TokenStream = crate::cpu::body(k, plan)
        .parse()
        .expect("the CPU backend writes valid Rust");
    quote! {
        #[allow(clippy::too_many_arguments)]
        fn cpu(
            #dims: &[usize],
            #(#t_names: &dyn #rt::Input<#t_types>,)*
            #(#s_names: #s_types,)*
            #(#out_names: &mut dyn #rt::Output<#outs>,)*
        ) -> ::core::result::Result<(), #rt::Error> {
            #(let #h_t = #rt::__private::host_read(#t_names)?;)*
            #(let mut #h_o = #rt::__private::host_read(&*#out_names)?;)*
            self::compute(#dims, #(&#h_t,)* #(#s_names,)* #(&mut #h_o),*);
            #(#rt::__private::host_write(#out_names, #h_o)?;)*
            ::core::result::Result::Ok(())
        }
        #[allow(unused, clippy::all, clippy::pedantic)]
        fn compute(#dims: &[usize], #(#p_t: &[#t_types],)* #(#p_s: #s_types,)* #(#out_idents: &mut [#outs]),*) {
            #(#dim_lets)*
            #body
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::kernel;
    use quote::quote;

    /// The row grid by reducing passes and outputs: W7's three passes (mean, variance, absolute
    /// maximum) and cross-entropy's value per row, against softmax's two passes and whole rows.
    #[test]
    fn row_grids_follow_the_reducing_passes() {
        let blocks = |tokens| {
            let k = kernel(tokens);
            let crate::ir::Launch::Rows { domain, .. } = &k.launch else {
                panic!("a row kernel")
            };
            super::row_blocks_per_sm(&k, domain, &crate::plan::plan(&k))
        };
        let quantize = blocks(quote! {
            fn q(x: [f32; rows, cols]) -> [i8; rows, cols] {
                let d = x - mean(x, cols);
                let y = d * rsqrt(mean(d * d, cols) + 1e-5);
                (y / (max(y.abs(), cols) / 127.0)).round() as i8
            }
        });
        let softmax = blocks(quote! {
            fn s(x: [f32; rows, cols]) -> [f32; rows, cols] { let e = (x - max(x, cols)).exp(); e / sum(e, cols) }
        });
        let cross_entropy = blocks(quote! {
            fn c(x: [f32; rows, cols], label: [i64; rows]) -> [f32; rows] {
                logsumexp(x, cols) - sum(if index(cols) as i64 == label { x } else { 0.0 }, cols)
            }
        });
        assert_eq!((quantize, softmax, cross_entropy), (40, 160, 40));
    }

    /// The grid where a block loads whole rows straight into registers: more blocks for
    /// RMSNorm than for softmax, none for layernorm with GELU, which copies its rows ahead.
    #[test]
    fn direct_row_grids_follow_the_cost_of_an_element() {
        let blocks = |tokens| {
            let k = kernel(tokens);
            super::direct_blocks_per_sm(&k, &crate::plan::plan(&k))
        };
        let rmsnorm = blocks(quote! {
            fn r(x: [f32; rows, cols], w: [f32; cols]) -> [f32; rows, cols] {
                x * rsqrt(mean(x * x, cols) + 1e-6) * w
            }
        });
        let softmax = blocks(quote! {
            fn s(x: [f32; rows, cols]) -> [f32; rows, cols] {
                let e = (x - max(x, cols)).exp();
                e / sum(e, cols)
            }
        });
        let layernorm_gelu = blocks(quote! {
            fn l(x: [f32; rows, cols], g: [f32; cols], b: [f32; cols]) -> [f32; rows, cols] {
                let d = x - mean(x, cols);
                gelu(d * rsqrt(mean(d * d, cols) + 1e-5) * g + b)
            }
        });
        assert_eq!((rmsnorm, softmax, layernorm_gelu), (480, 320, 0));
    }

    /// Elementwise grids: two vectors a thread where each element calls a math routine, four
    /// where a broadcast sets up each thread's work, eight for random numbers, else one.
    #[test]
    fn map_vectors_follow_the_work_per_element() {
        let vectors = |tokens| {
            let k = kernel(tokens);
            let crate::ir::Launch::Map { domain } = &k.launch else {
                panic!("an elementwise kernel")
            };
            super::map_vectors(&k, domain)
        };
        let tangent = vectors(
            quote! { fn t(x: [f32; n], y: [f32; n]) -> [f32; n] { x * y + x.abs().max(y) } },
        );
        let softplus = vectors(quote! { fn s(x: [f32; n]) -> [f32; n] { (x.exp() + 1.0).ln() } });
        let bias =
            vectors(quote! { fn b(x: [f32; r, c], b: [f32; c]) -> [f32; r, c] { (x + b).tanh() } });
        let noise =
            vectors(quote! { fn d(x: [f32; n], seed: u64) -> [f32; n] { x + randn(seed) } });
        assert_eq!((tangent, softplus, bias, noise), (1, 2, 4, 8));
    }
}
