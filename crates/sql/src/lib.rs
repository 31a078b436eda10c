//! pgfresh-sql
