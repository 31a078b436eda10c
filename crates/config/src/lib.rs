//! pgfresh-config
