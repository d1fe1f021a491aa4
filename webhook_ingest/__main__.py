from webhook_ingest.cli import main

main.main()
