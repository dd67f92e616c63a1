"""The front on the head: HAProxy publishing `vllm.port`, admitting only requests that carry the
API key (stacks/plan/front.py), from an image pulled on the head; and the key's files it and the
server read."""

from __future__ import annotations

import pulumi

from components.graph import Walk
from stacks.plan.names import FRONT, FRONT_CONTAINER, FRONT_PULL, FRONT_TLS


class Front(pulumi.ComponentResource):
    image_digest: pulumi.Output[str]  # the front image's repo digest (docs/operations.md, Outputs)
    # With front.tls: what its certificate's step printed (the certificate, front-tls-file.sh).
    tls_stdout: pulumi.Output[str] | None = None

    def __init__(self, walk: Walk, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:Front", FRONT, None, opts)
        walk.build(FRONT, parent=self)
        self.image_digest = walk.pulled(FRONT_PULL).repo_digest
        container = walk.container(FRONT_CONTAINER)
        if FRONT_TLS in walk.built:
            self.tls_stdout = walk.step(FRONT_TLS).stdout
        self.register_outputs({"containerId": container.id, "imageDigest": self.image_digest})
