from webhook_ingest.cli.main import main

main()
