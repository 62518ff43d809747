"""`python -m mgjit.cache {list,stats,clear,prune}`."""

from .cli import main

raise SystemExit(main())
