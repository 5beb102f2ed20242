from raco_cli.cli.main import main

raise SystemExit(main())
