"""The proxy's own YAML sections: loaded once, validated with clear errors, frozen; the
listen section and the SNI listener's server names."""
