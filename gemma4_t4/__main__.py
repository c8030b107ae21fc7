from gemma4_t4.cli import main

raise SystemExit(main())
