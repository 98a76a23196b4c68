"""`galahad unpin`: release pinned records (store/pins/) so that eviction may take them.

    galahad unpin (--document LABEL | --tenant T | --all) --root DIR [--json]

--document and --tenant together unpin that document's records of that tenant. A record
another document pins stays pinned. Prints the bytes no longer pinned, and what stays pinned
per tenant. Any unpin also repairs a damaged `pins/state` (counted again from the pin files
and the disk), so `galahad unpin --tenant NOBODY` is a repair that releases nothing.
"""

from __future__ import annotations

from ..errors import OperatorError
from .common import EXIT_OK, emit, open_store, root_options, size_text


def cmd_unpin(args) -> int:
    if not args.all and args.document is None and args.tenant is None:
        raise OperatorError("unpin needs --document, --tenant or --all")
    if args.all and (args.document is not None or args.tenant is not None):
        raise OperatorError("unpin --all takes neither --document nor --tenant")
    with open_store(args, writable=True) as store:
        released = store.unpin(document=args.document, tenant=args.tenant, everything=args.all)
        left = store.pinned_bytes_by_tenant()
    data = {"unpinned_bytes": released, "pinned_bytes_by_tenant": left}
    lines = [f"unpinned {size_text(released)}"]
    lines += [
        f"still pinned for tenant {tenant}: {size_text(size)}" for tenant, size in left.items()
    ]
    emit(args, data, "\n".join(lines))
    return EXIT_OK


def register(commands) -> None:
    """Adds `unpin` to the `galahad` command's subparsers."""
    unpin = commands.add_parser("unpin", help="release pinned records (galahad warm --pin)")
    root_options(unpin)
    which = unpin.add_argument_group("what to unpin (one of, or --document with --tenant)")
    which.add_argument("--document", metavar="LABEL", help="the document's label, as pinned")
    which.add_argument("--tenant", help="every pinned record of this tenant")
    which.add_argument("--all", action="store_true", help="every pinned record of the root")
    unpin.set_defaults(run=cmd_unpin)
