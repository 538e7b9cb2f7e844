//! `#[derive(Equivalence)]` for oxmpi: makes a plain Rust struct an MPI
//! datatype, as rsmpi's derive does. Use it through `oxmpi` (which
//! re-exports it as `oxmpi::datatype::Equivalence`, documented there);
//! the code it writes names `::oxmpi`.
//!
//! For a `#[repr(C)]` struct whose fields are `Equivalence` types or
//! arrays (of arrays) of them, it writes
//! - the `Equivalence` impl: a struct datatype with one block per field,
//!   at the offset the compiler chose (`offset_of!`), of as many elements
//!   as the field's arrays hold, resized to the struct's size; built once
//!   and kept in a `static`;
//! - a layout check the compiler evaluates: fields in declaration order,
//!   none overlapping the next, the last within the struct, and each
//!   array field exactly its elements — what `repr(C)` promises and the
//!   datatype relies on.
//!
//! Anything else (generic structs, enums, unions, other representations)
//! is a compile error that says why.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{parse_macro_input, Data, DeriveInput, Fields, Member, Type};

/// Derives `oxmpi::datatype::Equivalence`; see that re-export's docs.
#[proc_macro_derive(Equivalence)]
pub fn derive_equivalence(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// One field: how to name it, its type, and the element type and count of
/// its arrays (the field's own type and 1 when it is no array).
struct Field<'a> {
    member: Member,
    ty: &'a Type,
    element: &'a Type,
    count: Tokens,
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let name = &input.ident;
    check_repr(input)?;
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new(
            input.generics.span(),
            "#[derive(Equivalence)] does not take generic structs: each struct's datatype is \
             built once and kept in a static, which cannot depend on type parameters",
        ));
    }
    let fields = match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(named) => named.named.iter().collect::<Vec<_>>(),
            Fields::Unnamed(unnamed) => unnamed.unnamed.iter().collect(),
            Fields::Unit => Vec::new(),
        },
        Data::Enum(e) => {
            return Err(syn::Error::new(
                e.enum_token.span,
                "#[derive(Equivalence)] is for structs: not every value of an enum's bytes is \
                 one of its variants",
            ))
        }
        Data::Union(u) => {
            return Err(syn::Error::new(
                u.union_token.span,
                "#[derive(Equivalence)] is for structs: a union has no single layout of fields",
            ))
        }
    };
    let fields: Vec<Field> = fields
        .iter()
        .enumerate()
        .map(|(index, field)| {
            let member = match &field.ident {
                Some(ident) => Member::Named(ident.clone()),
                None => Member::Unnamed(index.into()),
            };
            let (element, count) = element_of(&field.ty);
            Field {
                member,
                ty: &field.ty,
                element,
                count,
            }
        })
        .collect();

    let entries = fields.iter().map(|f| {
        let Field {
            member,
            element,
            count,
            ..
        } = f;
        quote_spanned! {element.span()=>
            (
                ::core::mem::offset_of!(#name, #member),
                #count,
                <#element as ::oxmpi::datatype::Equivalence>::equivalent_datatype(),
            )
        }
    });
    let checks = layout_checks(name, &fields);
    Ok(quote! {
        // SAFETY: the datatype names each field, at its offset, by its
        // element type's datatype, which covers only that element's bytes
        // (`Equivalence`); fields never overlap and lie within the struct
        // (checked below), so no padding is named; any bytes, and all
        // zeros, make valid fields; and it is resized to `0..size_of`.
        unsafe impl ::oxmpi::datatype::Equivalence for #name {
            fn equivalent_datatype() -> ::oxmpi::datatype::DatatypeRef<'static> {
                static DATATYPE: ::std::sync::OnceLock<::oxmpi::datatype::UserDatatype> =
                    ::std::sync::OnceLock::new();
                ::oxmpi::datatype::Datatype::as_datatype_ref(DATATYPE.get_or_init(|| {
                    ::oxmpi::datatype::UserDatatype::of_struct_fields(
                        ::core::mem::size_of::<#name>(),
                        &[#(#entries),*],
                    )
                }))
            }
        }
        #checks
    })
}

/// Refuses a struct whose representation is not `C` (or `transparent`):
/// Rust's own may reorder fields, so the declaration order the datatype
/// follows need not be the order in memory.
fn check_repr(input: &DeriveInput) -> syn::Result<()> {
    let mut c_layout = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("repr")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("C") || meta.path.is_ident("transparent") {
                c_layout = true;
            }
            // `packed(N)`, `align(N)`: skip their arguments.
            if meta.input.peek(syn::token::Paren) {
                let _ = meta.input.parse::<proc_macro2::Group>()?;
            }
            Ok(())
        })?;
    }
    if c_layout {
        return Ok(());
    }
    Err(syn::Error::new(
        input.ident.span(),
        "#[derive(Equivalence)] needs #[repr(C)]: with Rust's own layout the compiler may \
         reorder fields, and a program built by another compiler could disagree",
    ))
}

/// The element type of a field's arrays and how many elements they hold:
/// `[[f64; 3]; 4]` is 12 `f64`s.
fn element_of(ty: &Type) -> (&Type, Tokens) {
    match ty {
        Type::Array(array) => {
            let (element, inner) = element_of(&array.elem);
            let len = &array.len;
            (element, quote! { (#len) * #inner })
        }
        Type::Group(group) => element_of(&group.elem),
        Type::Paren(paren) => element_of(&paren.elem),
        other => (other, quote! { 1usize }),
    }
}

/// The layout check: a constant whose evaluation fails to compile when a
/// field overlaps the next, ends past the struct, or an array field is
/// not exactly its elements.
fn layout_checks(name: &syn::Ident, fields: &[Field]) -> Tokens {
    let mut checks = Vec::new();
    for (i, field) in fields.iter().enumerate() {
        let Field {
            member,
            ty,
            element,
            count,
        } = field;
        checks.push(quote_spanned! {ty.span()=>
            assert!(
                ::core::mem::size_of::<#ty>() == #count * ::core::mem::size_of::<#element>(),
                "an array field is not exactly its elements"
            );
        });
        let end =
            quote! { ::core::mem::offset_of!(#name, #member) + ::core::mem::size_of::<#ty>() };
        let check = match fields.get(i + 1) {
            Some(next) => {
                let next = &next.member;
                quote! {
                    assert!(
                        #end <= ::core::mem::offset_of!(#name, #next),
                        "fields are not in declaration order without overlap, as repr(C) lays them out"
                    );
                }
            }
            None => quote! {
                assert!(#end <= ::core::mem::size_of::<#name>(), "a field ends past the struct");
            },
        };
        checks.push(check);
    }
    quote! {
        const _: () = {
            #(#checks)*
        };
    }
}
