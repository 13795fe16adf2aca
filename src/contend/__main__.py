from contend.cli.main import main

raise SystemExit(main())
