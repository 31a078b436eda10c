//! pgfresh-recency
