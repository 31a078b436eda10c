//! pgfresh-wire
