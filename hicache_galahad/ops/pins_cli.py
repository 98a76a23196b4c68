"""`galahad unpin`: release pinned records (store/pins/) so that eviction may take them.

    galahad unpin (--document LABEL | --tenant T | --all) --root DIR [--json]

--document and --tenant together unpin that document's records of that tenant. A record
another document pins stays pinned. Prints the bytes no longer pinned, and what stays pinned
per tenant. Any unpin also repairs a damaged `pins/state` (counted again from the pin files
and the disk), so `galahad unpin --tenant NOBODY` is a repair that releases nothing.
"""

from __future__ import annotations


def cmd_unpin(args) -> int:
    from . import cli

    if not args.all and args.document is None and args.tenant is None:
        raise cli.ExpectedCondition("unpin needs --document, --tenant or --all")
    if args.all and (args.document is not None or args.tenant is not None):
        raise cli.ExpectedCondition("unpin --all takes neither --document nor --tenant")
    with cli._open(args, writable=True) as store:
        released = store.unpin(document=args.document, tenant=args.tenant, everything=args.all)
        left = store.pinned_bytes_by_tenant()
    data = {"unpinned_bytes": released, "pinned_bytes_by_tenant": left}
    lines = [f"unpinned {cli._size(released)}"]
    lines += [
        f"still pinned for tenant {tenant}: {cli._size(size)}" for tenant, size in left.items()
    ]
    cli._emit(args, data, "\n".join(lines))
    return cli.EXIT_OK


def register(commands) -> None:
    """Adds `unpin` to the `galahad` command's subparsers."""
    from .cli import _root_options

    unpin = commands.add_parser("unpin", help="release pinned records (galahad warm --pin)")
    _root_options(unpin)
    which = unpin.add_argument_group("what to unpin (one of, or --document with --tenant)")
    which.add_argument("--document", metavar="LABEL", help="the document's label, as pinned")
    which.add_argument("--tenant", help="every pinned record of this tenant")
    which.add_argument("--all", action="store_true", help="every pinned record of the root")
    unpin.set_defaults(run=cmd_unpin)
