//! An in-process fake kube-apiserver (placeholder; being written).
