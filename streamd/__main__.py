from streamd.cli import main

raise SystemExit(main())
