"""What pulumi-docker's RemoteImage stores as `repoDigest`, at create and at every refresh
(terraform-provider-docker v4.5.0 `internal/provider/resource_docker_image_funcs.go`:
`resourceDockerImageCreate` ends with `return resourceDockerImageRead`, which stores
`determineRepoDigest(imageName, foundImage)`; `data_source_docker_image.go`
`determineRepoDigest`)."""

from __future__ import annotations


def repo_digest(name: str, repo_digests: list[str]) -> str:
    """The repo digest stored for an image found by `name`: none; the only one; else the first
    that begins with `name` up to its first colon ("we first need to strip a possible tag
    because the digest do not contain it": `strings.Index(imageName, ":")`, so a registry port
    cuts there too); else the first of them."""
    if not repo_digests:
        return ""
    if len(repo_digests) == 1:
        return repo_digests[0]
    colon = name.find(":")
    without_tag = name[:colon] if colon != -1 else name
    return next((d for d in repo_digests if d.startswith(without_tag)), repo_digests[0])
