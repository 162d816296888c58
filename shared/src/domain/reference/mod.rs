//! PLACEHOLDER: the reference e-commerce domain, being written.
