//! The fuzzer's inputs: a seeded generator, a pool of troublesome tokens, mutations of valid
//! programs and random token streams.
//!
//! Mutations work on a flat list of tokens in which every group is an opening and a closing
//! delimiter, so that a mutation can also delete, move or duplicate one side of a bracket; the
//! list is rebuilt into a tree by dropping unmatched closers and closing what is left open.

use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};

/// The most tokens a mutated input may hold: enough for long expressions and deep nesting, small
/// enough that one case stays quick in a debug build.
pub const MAX_TOKENS: usize = 6_000;

/// SplitMix64: a tiny generator that is good enough for fuzzing and needs no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`; `n` must not be 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// One element of a flattened token stream.
#[derive(Clone)]
pub enum Flat {
    Open(Delimiter),
    Close(Delimiter),
    Leaf(TokenTree),
}

pub fn flatten(tokens: TokenStream, out: &mut Vec<Flat>) {
    for tt in tokens {
        match tt {
            TokenTree::Group(g) => {
                out.push(Flat::Open(g.delimiter()));
                flatten(g.stream(), out);
                out.push(Flat::Close(g.delimiter()));
            }
            leaf => out.push(Flat::Leaf(leaf)),
        }
    }
}

/// Rebuilds a tree from a flat list; unmatched closers are dropped and open groups closed.
pub fn unflatten(flat: &[Flat]) -> TokenStream {
    let mut stack: Vec<(Delimiter, TokenStream)> = vec![(Delimiter::None, TokenStream::new())];
    for item in flat {
        match item {
            Flat::Open(d) => stack.push((*d, TokenStream::new())),
            Flat::Close(d) if stack.len() > 1 && stack.last().is_some_and(|(o, _)| o == d) => {
                close_group(&mut stack);
            }
            Flat::Close(_) => {}
            Flat::Leaf(tt) => stack.last_mut().expect("the root").1.extend([tt.clone()]),
        }
    }
    while stack.len() > 1 {
        close_group(&mut stack);
    }
    stack.pop().expect("the root").1
}

fn close_group(stack: &mut Vec<(Delimiter, TokenStream)>) {
    let (delimiter, inner) = stack.pop().expect("an open group");
    let group = Group::new(delimiter, inner);
    stack
        .last_mut()
        .expect("the root")
        .1
        .extend([TokenTree::Group(group)]);
}

/// Every Rust keyword (strict, reserved and weak), raw identifiers, unicode identifiers, the
/// language's own names, literals at and past every type's range, and every punctuation.
const POOL: &str = r##"
    as break const continue crate else enum extern false fn for if impl in let loop match mod move
    mut pub ref return self Self static struct super trait true type unsafe use where while async
    await dyn abstract become box do final macro override priv typeof unsized virtual yield try gen
    union macro_rules raw safe
    r#fn r#let r#as r#match r#x r#n r#f32 r#exp r#sum r#dev r#type r#loop r#gen r#try r#async
    größe ñ 변수 π µ ß ǅ x٣ _a _ __ a0 self_
    x y a b s n m k rows cols dev i w
    f16 bf16 f8e4m3 f8e5m2 f32 f64 i8 i16 i32 i64 u8 u16 u32 u64 bool usize isize i128 u128 char str
    exp exp2 ln log2 log10 sqrt rsqrt sin cos tan tanh sigmoid relu gelu abs min max clamp pow
    powf powi atan2 floor ceil round sum mean max_over min_over argmax argmin logsumexp prod
    select rand fma hypot signum is_nan
    0 1 2 7 255 256 65504 65536 2147483647 2147483648 4294967296 18446744073709551615
    18446744073709551616 340282366920938463463374607431768211455
    340282366920938463463374607431768211456u128 340282366920938463463374607431768211456
    99999999999999999999999999999999999999999999 0xFFFF_FFFF_FFFF_FFFF_FFFF_FFFF_FFFF_FFFFu128
    0xFFFF_FFFF_FFFF_FFFF_FFFF_FFFF_FFFF_FFFF_F 0b1 0o7 1_000 1u8 256u8 -1i8 128i8 65536u16 1i128
    1usize 1u999 1e999 1e999f32 1e-999 1e308 1e39f32 65520.0f16 1e5f16 1e38 3.4e38f32 0.0 1.0
    0.5f64 1.5bf16 1e10bf16 1.5f8e4m3 500.0f8e4m3 1e5f8e5m2 1f32 1f16 1_f64 1.0e0 1E+5 1.0xyz 2i32 1.0f128 'c' '\u{10FFFF}' "s"
    b"b" br"x" c"c" r"raw" r#"raw"# b'b' 1.0.0
    + - * / % ^ ! & | && || << >> += -= *= /= %= ^= &= |= <<= >>= = == != > < >= <= @ . .. ...
    ..= , ; : :: -> => # $ ? ~ 'a 'static
"##;

/// The pool, whole and by kind: a token replaced by one of its kind keeps more inputs valid, so
/// that more of them reach the later stages.
pub struct Pool {
    pub all: Vec<TokenTree>,
    by_kind: [Vec<TokenTree>; 3],
}

impl Pool {
    pub fn new() -> Pool {
        let all = pool();
        let by_kind = [0, 1, 2].map(|k| all.iter().filter(|t| kind(t) == k).cloned().collect());
        Pool { all, by_kind }
    }

    /// A pool token of the same kind as `tt`: identifier, literal, or punctuation and groups.
    fn like(&self, rng: &mut Rng, tt: &TokenTree) -> TokenTree {
        rng.pick(&self.by_kind[kind(tt)]).clone()
    }
}

fn kind(tt: &TokenTree) -> usize {
    match tt {
        TokenTree::Ident(_) => 0,
        TokenTree::Literal(_) => 1,
        _ => 2,
    }
}

/// The pool as single tokens and groups, parsed once.
fn pool() -> Vec<TokenTree> {
    let mut tokens: Vec<TokenTree> = POOL
        .split_whitespace()
        .flat_map(|word| word.parse::<TokenStream>().unwrap_or_default())
        .collect();
    for delimiter in [
        Delimiter::Parenthesis,
        Delimiter::Bracket,
        Delimiter::Brace,
        Delimiter::None,
    ] {
        tokens.push(TokenTree::Group(Group::new(delimiter, TokenStream::new())));
    }
    tokens.push(TokenTree::Group(Group::new(
        Delimiter::None,
        "x + 1".parse().expect("tokens"),
    )));
    tokens
}

/// The flat tokens of `text`.
fn parse(text: &str) -> Vec<Flat> {
    let mut out = vec![];
    flatten(text.parse().expect("tokens"), &mut out);
    out
}

/// A mutation of `seed`: a few edits of the kinds that find bugs, sometimes one that builds a
/// deep or long input, sometimes a splice from `other`.
pub fn mutate(rng: &mut Rng, seed: &[Flat], other: &[Flat], pool: &Pool) -> Vec<Flat> {
    let mut flat = seed.to_vec();
    if rng.chance(2) {
        replace_alike(rng, &mut flat, pool);
    } else {
        for _ in 0..1 + rng.below(4) {
            edit(rng, &mut flat, other, &pool.all);
        }
    }
    if rng.chance(40) {
        grow(rng, &mut flat);
    }
    flat.truncate(MAX_TOKENS);
    flat
}

/// Replaces one token by a pool token of its kind: the gentlest edit, which often leaves a valid
/// kernel with an unusual name, literal or operator.
fn replace_alike(rng: &mut Rng, flat: &mut [Flat], pool: &Pool) {
    if flat.is_empty() {
        return;
    }
    let at = rng.below(flat.len());
    let Flat::Leaf(tt) = &flat[at] else {
        return;
    };
    // Half the time a token of the kernel itself: another of its names, literals or operators.
    let own: Vec<&TokenTree> = flat
        .iter()
        .filter_map(|f| match f {
            Flat::Leaf(other) if kind(other) == kind(tt) => Some(other),
            _ => None,
        })
        .collect();
    let new = if rng.chance(2) {
        (*rng.pick(&own)).clone()
    } else {
        pool.like(rng, tt)
    };
    flat[at] = Flat::Leaf(new);
}

fn edit(rng: &mut Rng, flat: &mut Vec<Flat>, other: &[Flat], pool: &[TokenTree]) {
    let len = flat.len().max(1);
    let at = rng.below(len).min(flat.len());
    match rng.below(7) {
        0 if !flat.is_empty() => {
            let n = 1 + rng.below(3);
            flat.drain(at..(at + n).min(flat.len()));
        }
        1 if !flat.is_empty() => {
            let (first, second) = (at.min(flat.len() - 1), rng.below(flat.len()));
            flat.swap(first, second);
        }
        2 if !flat.is_empty() => {
            let end = (at + 1 + rng.below(8)).min(flat.len());
            let copy: Vec<Flat> = flat[at..end].to_vec();
            flat.splice(end..end, copy);
        }
        3 if at < flat.len() => flat[at] = Flat::Leaf(rng.pick(pool).clone()),
        4 => flat.insert(at, Flat::Leaf(rng.pick(pool).clone())),
        5 if !other.is_empty() => {
            let from = rng.below(other.len());
            let end = (from + 1 + rng.below(12)).min(other.len());
            flat.splice(at..at, other[from..end].iter().cloned());
        }
        _ => flat.insert(at, Flat::Leaf(rng.pick(pool).clone())),
    }
}

/// Makes the input deep or long: nested parentheses, a long chain of operators, many
/// parameters, dims or `let`s, always at a random place so that every stage meets them.
fn grow(rng: &mut Rng, flat: &mut Vec<Flat>) {
    let at = rng.below(flat.len().max(1)).min(flat.len());
    let n = [10, 100, 300, 1000, 2000][rng.below(5)];
    let piece: Vec<Flat> = match rng.below(6) {
        0 => {
            let mut p = vec![Flat::Open(Delimiter::Parenthesis); n];
            p.extend(parse("x"));
            p.extend(vec![Flat::Close(Delimiter::Parenthesis); n]);
            p
        }
        1 => (0..n).flat_map(|_| parse("x +")).collect(),
        2 => (0..n).flat_map(|_| parse("-")).collect(),
        3 => (0..n).flat_map(|_| parse(".exp()")).collect(),
        4 => (0..n)
            .flat_map(|i| parse(&format!("p{i}: [f32; d{i}],")))
            .collect(),
        _ => (0..n)
            .flat_map(|i| parse(&format!("let v{i} = x * {i}.0;")))
            .collect(),
    };
    flat.splice(at..at, piece);
}

/// A random stream: pool tokens in random groups, nothing of the language's shape.
pub fn random_stream(rng: &mut Rng, pool: &[TokenTree]) -> Vec<Flat> {
    let len = 1 + rng.below(80);
    let mut flat = Vec::with_capacity(len);
    for _ in 0..len {
        let item = match rng.below(10) {
            0 => Flat::Open(*rng.pick(&DELIMITERS)),
            1 => Flat::Close(*rng.pick(&DELIMITERS)),
            _ => Flat::Leaf(rng.pick(pool).clone()),
        };
        flat.push(item);
    }
    flat
}

const DELIMITERS: [Delimiter; 4] = [
    Delimiter::Parenthesis,
    Delimiter::Bracket,
    Delimiter::Brace,
    Delimiter::None,
];
