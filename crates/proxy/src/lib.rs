//! pgfresh-proxy
