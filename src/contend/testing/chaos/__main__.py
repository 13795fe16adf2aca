from contend.testing.chaos.runner import main

raise SystemExit(main())
