//! The gRPC contracts of the control plane, one module per service
//! (`vynil.<service>.v1`), generated at build time from `proto/vynil/**`.
//!
//! The `.proto` files are the documentation of record: every message and field is
//! described there. Servers generated here answer `UNIMPLEMENTED` for any RPC a
//! service has not implemented, never fake data.

#![allow(missing_docs, clippy::all, missing_debug_implementations)]

pub mod catalog {
    pub mod v1 {
        tonic::include_proto!("vynil.catalog.v1");
    }
}

pub mod scanner {
    pub mod v1 {
        tonic::include_proto!("vynil.scanner.v1");
    }
}

pub mod purger {
    pub mod v1 {
        tonic::include_proto!("vynil.purger.v1");
    }
}

pub mod lifecycle {
    pub mod v1 {
        tonic::include_proto!("vynil.lifecycle.v1");
    }
}

/// Encoded `FileDescriptorSet` of every service, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vynil_descriptor.bin"));
