from benchmarks.sustained.run import main

raise SystemExit(main())
