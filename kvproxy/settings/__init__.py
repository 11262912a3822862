"""What the proxy and the audit both read from kvproxy's configuration file.

The relay (`proxy`) and the audit job (`pipeline`) read the same YAML file and must agree on it:
how it is read and its problems reported by line (`kvproxy.settings.yaml_file`,
`kvproxy.settings.loading`), the
`errors` section (`kvproxy.settings.sections`) and the code a rejection is answered with
(`kvproxy.settings.errors`), the policy sections that become a `TopicRouting`
(`kvproxy.settings.rules`), and
`host:port` addresses (`kvproxy.settings.addresses`). Only `protocol` and `policies` are below it.
"""
