//! pgfresh-balancer
