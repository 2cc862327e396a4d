from msprobe.cli import main

raise SystemExit(main())
