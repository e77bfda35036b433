//! The gRPC contracts of the control plane, one module per service
//! (`vynil.<service>.v1`), generated at build time from `proto/vynil/**`.
//!
//! The `.proto` files are the documentation of record: every message and field is
//! described there. Servers generated here answer `UNIMPLEMENTED` for any RPC a
//! service has not implemented, never fake data. [`convert`] is the one
//! conversion between the rules' types and their wire form.

pub mod catalog {
    #[allow(missing_docs, clippy::all, missing_debug_implementations)]
    pub mod v1 {
        tonic::include_proto!("vynil.catalog.v1");
    }
}

pub mod scanner {
    #[allow(missing_docs, clippy::all, missing_debug_implementations)]
    pub mod v1 {
        tonic::include_proto!("vynil.scanner.v1");
    }
}

pub mod purger {
    #[allow(missing_docs, clippy::all, missing_debug_implementations)]
    pub mod v1 {
        tonic::include_proto!("vynil.purger.v1");
    }
}

pub mod lifecycle {
    #[allow(missing_docs, clippy::all, missing_debug_implementations)]
    pub mod v1 {
        tonic::include_proto!("vynil.lifecycle.v1");
    }
}

/// The one conversion between the rules' package and the catalog's wire package.
pub mod convert;

/// Encoded `FileDescriptorSet` of every service, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vynil_descriptor.bin"));
