from navrl_daemon.cli import main

raise SystemExit(main())
