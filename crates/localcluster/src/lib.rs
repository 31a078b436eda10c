//! pgfresh-localcluster
