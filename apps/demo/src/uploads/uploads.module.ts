import { Module, type DynamicModule } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { DataSource } from 'typeorm';
import { PostgresOutcomeRecorder } from 'nestjs-idempotency/typeorm';
import { UploadsController } from './uploads.controller.js';
import { UPLOADS_DEFAULTS, UPLOADS_OPTIONS, type UploadsOptions } from './uploads.options.js';
import { UploadsService } from './uploads.service.js';
import { XmlUpload } from './xml-upload.entity.js';

/** `POST /uploads/xml` and `GET /uploads/:uploadId`, with the outcome recorder on the app's DataSource. */
@Module({})
export class UploadsModule {
  static register(options: UploadsOptions = {}): DynamicModule {
    return {
      module: UploadsModule,
      imports: [TypeOrmModule.forFeature([XmlUpload])],
      controllers: [UploadsController],
      providers: [
        { provide: UPLOADS_OPTIONS, useValue: options },
        {
          provide: PostgresOutcomeRecorder,
          inject: [DataSource],
          useFactory: (dataSource: DataSource) =>
            new PostgresOutcomeRecorder(dataSource, {
              leaseMs: options.leaseMs ?? UPLOADS_DEFAULTS.leaseMs,
              retentionMs: options.retentionMs ?? UPLOADS_DEFAULTS.retentionMs,
              purgeIntervalMs: options.purgeIntervalMs ?? UPLOADS_DEFAULTS.purgeIntervalMs,
            }),
        },
        UploadsService,
      ],
    };
  }
}
